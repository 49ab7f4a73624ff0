"""Built-in ops.  Each module is one op -- schema, C++ kernel, NumPy reference
(and gradient) side by side -- written only with the public API, so any of
them can be copied as the template of a new op."""
from . import relu  # noqa: F401
from . import add  # noqa: F401
from . import mul  # noqa: F401
from . import sub  # noqa: F401
from . import reduce_sum  # noqa: F401
from . import softmax  # noqa: F401
from . import exp  # noqa: F401
from . import tanh  # noqa: F401
from . import matmul  # noqa: F401
from . import neg  # noqa: F401
from . import reshape  # noqa: F401
from . import transpose  # noqa: F401
from . import reorder  # noqa: F401
from . import leaky_relu  # noqa: F401
from . import div  # noqa: F401
from . import pow  # noqa: F401
from . import maximum  # noqa: F401
from . import minimum  # noqa: F401
from . import comparison  # noqa: F401
from . import where  # noqa: F401
from . import sqrt  # noqa: F401
from . import log  # noqa: F401
from . import abs  # noqa: F401
from . import cast  # noqa: F401
from . import slice  # noqa: F401
from . import squeeze  # noqa: F401
from . import unsqueeze  # noqa: F401
from . import concat  # noqa: F401
from . import dim  # noqa: F401
from . import mean  # noqa: F401
