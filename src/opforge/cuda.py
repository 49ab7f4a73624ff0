"""opforge.cuda: the stream opforge's GPU calls run on, and the devices it sees.

``with opforge.cuda.stream(s):`` makes GPU ops called in this thread run on
``s`` (an int ``cudaStream_t``, an object with ``__cuda_stream__()``, a
``torch.cuda.Stream`` or a CuPy stream).  Without it, an op on torch or CuPy
arrays runs on that framework's current stream, and on others on the legacy
default stream.  Calls never synchronize: ``synchronize`` waits when you need
the results on the host through other means than the framework's own.
"""
from .runtime.cuda import current_stream, device_count, is_available, stream, synchronize

__all__ = ["current_stream", "device_count", "is_available", "stream", "synchronize"]
