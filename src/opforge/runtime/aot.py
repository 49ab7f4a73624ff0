"""Kernels from an aot-ABI library: ``"path/file.cc:Func"`` or a prebuilt ``.so``.

The library may export ``Func`` (required), ``FuncInit`` and
``FuncInferShape``.  Init runs once per distinct input signature (shapes,
dtypes, attribute values); its workspace sizes and kernel data are kept in a
bounded cache and reused.  Kernel data is deleted when its entry is evicted or
the kernel is dropped.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _native
from ..attrs import attr_key
from ..bounded_cache import BoundedCache
from ..errors import AllocationError, CompileError, InferenceError, KernelSourceError, SchemaError
from ..operator import RUNTIME, Kernel
from ..spec import TensorSpec
from . import build as _build
from . import prebuilt as _prebuilt
from .cache import cache_errors
from .cpu import ISA_COMPILE_FLAGS, normalize_isa
from .library import load_library

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..attrs import AttrValue
    from ..operator import DTypeSignatures, KernelDTypes, Op
    from .library import Library

    #: What the native launcher runs for one signature: the function, the outputs' shapes and dtypes, the
    #: workspace sizes, every tensor's dtype name and the kernel's Extra.
    NativePlan = tuple[int | None, tuple[tuple[int, ...], ...], tuple[np.dtype[Any], ...], tuple[int, ...],
                       tuple[str, ...], Any]

INIT_CACHE_SIZE = 64
WORKSPACE_ALIGN = 64
MAX_ALLOCATION_BYTES = 2**62  # more than any address space: such requests never reach malloc


def split_func(func: object) -> tuple[Path, str]:
    """``"path/file.cc:Func"`` -> (Path, "Func")."""
    path, sep, name = str(func).rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise SchemaError(f"func must look like 'path/to/file.cc:FunctionName', got {func!r}")
    return Path(os.path.expanduser(path)), name


def workspace_sizes(requested: Sequence[int], floor_bytes: int, *, op: str, function: str) -> tuple[int, ...]:
    """Byte sizes to allocate for the workspace that ``function`` (an Init) of
    op ``op`` requested.  Rounded up to ``floor_bytes`` (the largest input's
    size: some kernels written for MindSpore pass element counts, not bytes,
    and rely on such generous rounding), then to a multiple of 64: callers lay
    the buffers out one after another, so each keeps the next one aligned."""
    sizes = tuple(-(-max(int(s), floor_bytes) // WORKSPACE_ALIGN) * WORKSPACE_ALIGN for s in requested)
    if sum(sizes) > MAX_ALLOCATION_BYTES:
        raise AllocationError(f"op '{op}': {function} requested workspace sizes {list(requested)} (bytes), "
                              f"{sum(sizes)} in all: more than any allocation can hold", op=op, function=function)
    return sizes


def present(specs: Iterable[TensorSpec | None]) -> list[TensorSpec]:
    """The specs of the inputs a call passes through the ABI: the present ones."""
    return [s for s in specs if s is not None]


def largest_nbytes(arrays: Iterable[npt.NDArray[Any] | None]) -> int:
    return max((a.nbytes for a in arrays if a is not None), default=0)


class AotKernel(Kernel):
    """A kernel function in a C/C++/CUDA library following the aot ABI."""

    _function: int | None  # the entry points, once loaded (Init and InferShape are optional)
    _init: int | None
    _infer: int | None

    def __init__(self, func: str | os.PathLike[str], *, device: str = "cpu", dtypes: DTypeSignatures | None = None,
                 isa: str | None = None, layout: str = "ndarray", cflags: Iterable[str] = (),
                 include_dirs: Iterable[str | os.PathLike[str]] = (), cxx11_abi: bool | None = None,
                 name: str | None = None, init_cache_size: int = INIT_CACHE_SIZE) -> None:
        path, function = split_func(func)
        super().__init__(device=device, dtypes=dtypes, isa=isa, layout=layout, name=name or function)
        self.priority = 2  # native kernels before Python ones
        self.path = path if path.is_absolute() else Path.cwd() / path  # MindSpore resolves from the cwd
        self.function_name = function
        self.cflags = tuple(cflags)
        self.include_dirs = tuple(include_dirs)
        self.cxx11_abi = cxx11_abi
        self.library: Library | None = None
        self.compiled = False  # whether loading it ran a compiler (else: the cache or the prebuilt set)
        self.code: str | None = None  # source text, for kernels declared with code=
        self.builtin = False  # declared by opforge.builtins: may load from the prebuilt set
        self._function = self._init = self._infer = None
        # Bounded: shapes and attribute values may vary per call.  An evicted
        # Extra deletes its kernel data when the last call using it ends.
        self._inits: BoundedCache[tuple[object, ...], tuple[Any, tuple[int, ...]]] = BoundedCache(
            init_cache_size, lru=True)  # signature -> (Extra, workspace sizes)
        # attribute values -> Extra used without Init
        self._attr_extras: BoundedCache[tuple[tuple[str, object], ...], Any] = BoundedCache(init_cache_size)

    def reject_reason(self, op: Op, specs: Sequence[TensorSpec | None]) -> str | None:
        for index, spec in enumerate(specs):
            # the C ABI has no way to say "absent": only a kernel made for calls without the input takes one
            if spec is None and op.input_name(index) not in self.absent_inputs:
                return (f"input '{op.input_name(index)}' is absent, and a native kernel needs every input "
                        "(unless it is declared with absent_inputs)")
        return super().reject_reason(op, specs)

    @property
    def location(self) -> str:
        return str(self.path)

    def load(self) -> AotKernel:
        """Build (or fetch from the cache) and load the library; resolve entry points."""
        if self.library is not None:
            return self
        missing = self.requires() if self.requires is not None else None  # e.g. loads OpenBLAS first
        if missing:
            raise KernelSourceError(f"kernel '{self.name}' cannot be loaded: {missing}")
        built = _prebuilt.lookup(self)  # a built-in compiled with the package: no compiler needed
        if built is None:
            if self.code is not None:
                with cache_errors():  # inline sources live in the cache folder
                    write_inline_source(self.path, self.code)
            elif not self.path.exists():
                raise KernelSourceError(f"kernel '{self.name}': {self.path} does not exist "
                                        "(relative paths resolve from the working directory)")
            if _build.is_source(self.path):
                start = time.perf_counter()
                owner = f"op '{self.op_name}', " if self.op_name else ""
                try:
                    built = _build.build(self.path, extra_cflags=self.cflags, include_dirs=self.include_dirs,
                                         # (mypy checks a ** dict against every keyword; this one holds cxx11_abi)
                                         **({} if self.cxx11_abi is None  # type: ignore[arg-type]
                                            else {"cxx11_abi": self.cxx11_abi}))
                except CompileError as error:  # say whose source it is: an inline one's path is a cache file
                    raise CompileError(f"{owner}kernel {self.name}: {error}", command=error.command,
                                       output=error.output) from None
                self.compiled = not built.from_cache
                if not built.from_cache:
                    _build.report_build(f"{owner}kernel {self.name}", time.perf_counter() - start)
        if built is not None:
            library = load_library(built.path, cxx11_abi=built.cxx11_abi)
        else:
            library = load_library(self.path, cxx11_abi=self.cxx11_abi)
        self._function = library.address(self.function_name)
        self._init = library.address(self.function_name + "Init", required=False)
        self._infer = library.address(self.function_name + "InferShape", required=False)
        self.library = library
        return self

    @property
    def has_infer_shape(self) -> bool:
        return self.load()._infer is not None

    @property
    def has_init(self) -> bool:
        return self.load()._init is not None

    # -- attributes and Init ----------------------------------------------
    def _extra_for_attrs(self, op: Op, attrs: Mapping[str, AttrValue]) -> Any:
        return self._attr_extras.get_or_create(
            attr_key(attrs), lambda: _native.Extra(op.name, dict(attrs),
                                                   self.library.cxx11_abi))  # type: ignore[union-attr]  # loaded

    def signature_state(self, op: Op, specs: Sequence[TensorSpec],
                        attrs: Mapping[str, AttrValue]) -> tuple[Any, tuple[int, ...]]:
        """(Extra, workspace sizes) for inputs+outputs ``specs``; runs Init once per signature."""
        self.load()
        if self._init is None:
            return self._extra_for_attrs(op, attrs), ()
        key = (tuple((s.shape, s.dtype) for s in specs), attr_key(attrs))
        return self._inits.get_or_create(key, lambda: self._run_init(op, specs, attrs))

    def _run_init(self, op: Op, specs: Sequence[TensorSpec],
                  attrs: Mapping[str, AttrValue]) -> tuple[Any, tuple[int, ...]]:
        from .dispatch import kernel_error

        extra = _native.Extra(op.name, dict(attrs), self.library.cxx11_abi)  # type: ignore[union-attr]  # loaded
        rc, error = _native.call_init(self._init, extra, [s.shape for s in specs], [s.dtype for s in specs])
        if rc != 0 or error is not None:
            raise kernel_error(op, self, rc, error, function=self.function_name + "Init")
        return extra, tuple(extra.workspace)

    @property
    def init_cache_entries(self) -> int:
        return len(self._inits)

    @property
    def init_cache_size(self) -> int:
        return self._inits.capacity

    @init_cache_size.setter
    def init_cache_size(self, size: int) -> None:
        self._inits.capacity = self._attr_extras.capacity = size

    # -- inference --------------------------------------------------------
    def infer(self, op: Op, specs: Sequence[TensorSpec | None],
              attrs: Mapping[str, AttrValue]) -> list[TensorSpec] | None:
        if not self.has_infer_shape:
            return None
        from .dispatch import kernel_error

        several = len(op.outputs) > 1
        shapes, error = _native.call_infer(self._infer, self._extra_for_attrs(op, attrs),
                                           [s.shape for s in present(specs)],
                                           several)
        if error is not None:
            raise kernel_error(op, self, 0, error, function=self.function_name + "InferShape")
        if len(shapes) != len(op.outputs):
            raise InferenceError(f"op '{op.name}': {self.function_name}InferShape returned {len(shapes)} shape(s) "
                                 f"for {len(op.outputs)} output(s)")
        # InferShape gives shapes only; the dtype is the first input's (ops set dtypes with their inference).
        dtype = next((s.dtype for s in specs if s is not None), "float32")
        return [TensorSpec(shape, dtype) for shape in shapes]

    # -- running ------------------------------------------------------------
    def plan(self, op: Op, arrays: Sequence[npt.NDArray[Any]], specs: Sequence[TensorSpec | None],
             out_specs: Sequence[TensorSpec], attrs: Mapping[str, AttrValue]) -> NativePlan | None:
        """The native launcher's plan for one signature (CPU kernels only)."""
        if self.device != "cpu":
            return None
        specs = present(specs)
        extra, requested = self.signature_state(op, list(specs) + list(out_specs), attrs)
        return (self._function,
                tuple(s.shape for s in out_specs),
                tuple(np.dtype(s.dtype) for s in out_specs),
                workspace_sizes(requested, largest_nbytes(arrays), op=op.name, function=self.function_name + "Init"),
                tuple(s.dtype for s in list(specs) + list(out_specs)),
                extra)

    def run(self, op: Op, arrays: Sequence[Any], attrs: Mapping[str, AttrValue], out_specs: Sequence[TensorSpec],
            in_specs: Sequence[TensorSpec | None] | None = None, *, poison: int | None = None) -> list[npt.NDArray[Any]]:
        """One call outside the launcher, with the same memory checks.  ``poison``
        (a byte) runs it in checked mode with outputs and workspaces filled
        with that byte (``check_op`` uses it to find never-written output)."""
        from .dispatch import as_array, input_specs, kernel_error

        # the kernel gets the present inputs only (absent ones are those of its absent_inputs)
        specs = present(in_specs if in_specs is not None else input_specs(op, arrays))
        if self.device == "gpu":
            from . import cuda

            extra, requested = self.signature_state(op, specs + list(out_specs), attrs)
            sizes = workspace_sizes(requested, largest_nbytes(arrays), op=op.name,
                                    function=self.function_name + "Init")
            shapes = [s.shape for s in specs] + [s.shape for s in out_specs]
            names = [s.dtype for s in specs] + [s.dtype for s in out_specs]
            return cuda.run_host_arrays(self, op, [a for a in arrays if a is not None], out_specs, sizes, shapes,
                                        names, extra)
        arrays = tuple(as_array(op, k, a) for k, a in enumerate(arrays) if a is not None)
        if any(s is not None and s.layout != "ndarray" for s in list(specs) + list(out_specs)):
            return self._run_blocked(op, arrays, specs, out_specs, attrs)
        plan = self.plan(op, arrays, specs, out_specs, attrs)
        outputs, rc, error = _native.run_plan(plan, arrays, -1 if poison is None else poison)
        if outputs is None:
            raise kernel_error(op, self, rc, error)
        return list(outputs)


    def _run_blocked(self, op: Op, arrays: Sequence[npt.NDArray[Any]], specs: Sequence[TensorSpec],
                     out_specs: Sequence[TensorSpec], attrs: Mapping[str, AttrValue]) -> list[npt.NDArray[Any]]:
        """A call on a blocked layout (nchw16c) outside a planned graph: such a tensor is a
        flat buffer of the layout's padded size, while the kernel is told the logical
        shapes (as the planned executor does; the launcher sizes buffers by their shapes)."""
        from .dispatch import kernel_error

        extra, requested = self.signature_state(op, list(specs) + list(out_specs), attrs)
        sizes = workspace_sizes(requested, largest_nbytes(arrays), op=op.name, function=self.function_name + "Init")
        outputs = [np.empty(s.shape if s.layout == "ndarray" else s.nbytes // np.dtype(s.dtype).itemsize,
                            np.dtype(s.dtype)) for s in out_specs]
        workspace = np.empty(max(sum(sizes), 1), np.uint8)
        offsets = np.cumsum((0,) + tuple(sizes[:-1])) if sizes else ()
        pointers = [a.ctypes.data for a in arrays] + [o.ctypes.data for o in outputs] + \
                   [workspace.ctypes.data + int(k) for k in offsets]
        rc, error = _native.call_kernel(self._function, pointers, [s.shape for s in list(specs) + list(out_specs)],
                                        [s.dtype for s in list(specs) + list(out_specs)], 0, extra)
        if rc != 0 or error is not None:
            raise kernel_error(op, self, rc, error)
        return outputs


# C types behind OPFORGE_T for each dtype a templated source is compiled for.
C_TYPES = {"bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
           "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
           "float16": "_Float16", "float32": "float", "float64": "double"}


def write_inline_source(path: Path, code: str) -> None:
    """(Re)write a kernel source given as a string; atomic, as concurrent writers write the same bytes."""
    if path.exists() and path.read_text() == code:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, suffix=path.suffix)
    with os.fdopen(fd, "w") as handle:
        handle.write(code)
    os.replace(temporary, path)


def inline_source_path(op_name: str, code: str, suffix: str) -> Path:
    """Where a source given as a string lives: content-addressed, in the cache's
    hidden ``.inline`` folder (not a cache entry)."""
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    stem = "".join(c if c.isalnum() else "_" for c in op_name)
    return _build.cache_dir() / ".inline" / f"{stem}-{digest}{suffix}"


def dtype_flags(op: Op, signature: Sequence[str | None] | None) -> list[str]:
    """-D flags selecting one dtype variant of a templated source."""
    if signature is None:
        return []
    names = [i.name for i in op.inputs] + list(op.outputs)
    return named_dtype_flags([(n, d) for n, d in zip(names, signature) if d is not None])


def named_dtype_flags(typed: Sequence[tuple[str | None, str]]) -> list[str]:
    """-D flags for (name, dtype) pairs: OPFORGE_T is the first dtype's C type; a named
    pair also sets OPFORGE_T_<name> (``opforge build --dtype`` passes None for a bare dtype)."""
    if not typed:
        return []
    flags = [f"-DOPFORGE_T={C_TYPES[typed[0][1]]}", f"-DOPFORGE_DTYPE_{typed[0][1].upper()}=1"]
    flags += [f"-DOPFORGE_T_{n}={C_TYPES[d]}" for n, d in typed if n is not None]
    return flags


def layout_flags(layout: str) -> list[str]:
    """-D flag of a kernel compiled for a blocked layout (``OPFORGE_LAYOUT_NCHW16C``)."""
    return [] if layout in ("ndarray", "any") else [f"-DOPFORGE_LAYOUT_{layout.upper()}=1"]


def source_kernels(op: Op, *, source: str | os.PathLike[str] | None, code: str | None, function: str | None,
                   device: str, signatures: DTypeSignatures | None, dtypes: KernelDTypes, isa: str | None, layout: str,
                   cflags: Iterable[str], include_dirs: Iterable[str | os.PathLike[str]],
                   name: str | None) -> list[Kernel]:
    """The AotKernels for one source: one per dtype variant, compiled with the ISA's flags."""
    if code is not None:
        if not function:
            raise SchemaError(f"op '{op.name}': a kernel given as code needs function='FunctionName'")
        source = f"{inline_source_path(op.name, code, '.cu' if device == 'gpu' else '.cc')}:{function}"
    elif function is not None:
        source = f"{source}:{function}"
    isa_flags = ISA_COMPILE_FLAGS[normalize_isa(isa)] if device == "cpu" else []
    variants = signatures if (signatures and isinstance(dtypes, dict)) else [None]
    builtin = _prebuilt.declared_by_builtins()  # before the loop: one look at the callers
    kernels: list[Kernel] = []
    for variant in variants:
        flags = list(cflags) + isa_flags + dtype_flags(op, variant) + layout_flags(layout)
        label = name or split_func(source)[1]
        if isa:
            label += f"[{normalize_isa(isa)}]"
        if variant is not None:
            label += "<" + ",".join(d for d in variant if d) + ">"
        if layout not in ("ndarray", "any"):
            label += f"@{layout}"
        kernel = AotKernel(source,  # type: ignore[arg-type]  # None only with code=, which replaced it above
                           device=device, dtypes=[variant] if variant else signatures, isa=isa,
                           layout=layout, cflags=flags, include_dirs=include_dirs, name=label)
        kernel.code = code  # written to its path when the kernel is loaded
        kernel.builtin = builtin
        kernels.append(kernel)
    return kernels


RUNTIME.source_kernels = source_kernels
