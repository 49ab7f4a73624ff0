"""opforge._native's DLPack types: DLTensorView reads a producer's capsule,
DLPackExport hands opforge's memory to any from_dlpack.  CPU only: a CUDA
array is faked by a DLPackExport with device_type 2 (see fake_cuda)."""
import ctypes
import gc
import sys
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from opforge import _native, dtypes
from opforge._native import DLPackExport, DLTensorView

pytestmark = pytest.mark.usefixtures("jax_on_host")
HOST_DTYPES = [name for name in dtypes.ABI_DTYPES if name != "bfloat16"]  # NumPy has no DLPack bfloat16


class Owner:
    """Something that owns memory and can be watched with a weakref."""

    def __init__(self, array):
        self.array = array


def export_of(array, device_type=1, device_id=0, owner=None, **kwargs):
    return DLPackExport(array.ctypes.data, array.shape, dtypes.abi_name(array.dtype), device_type, device_id,
                        array if owner is None else owner, **kwargs)


def fake_cuda(array, device_id=0):
    """A host array dressed as a CUDA one: what a device array looks like to opforge on a machine without a GPU."""
    return export_of(array, device_type=2, device_id=device_id)


def capsule_name(capsule):
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return get_name(capsule).decode()


# ------------------------------------------------------------ DLPackExport

def test_numpy_from_export_shares_memory_and_keeps_the_owner_alive():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    owner = weakref.ref(arr)
    out = np.from_dlpack(DLPackExport(arr.ctypes.data, arr.shape, "float32", 1, 0, arr))
    assert out.shape == (2, 3) and out.dtype == np.float32
    assert out.ctypes.data == arr.ctypes.data and np.shares_memory(out, arr)
    out[1, 2] = -1
    assert arr[1, 2] == -1
    del arr
    gc.collect()
    assert owner() is not None  # the consumer's tensor holds it
    assert out.tolist() == [[0, 1, 2], [3, 4, -1]]
    del out
    gc.collect()
    assert owner() is None


@pytest.mark.parametrize("name", HOST_DTYPES)
def test_every_host_dtype_round_trips_through_numpy(name):
    arr = (np.arange(5) % 2).astype(dtypes.to_numpy(name))
    out = np.from_dlpack(export_of(arr))
    assert out.dtype == arr.dtype and np.shares_memory(out, arr)
    assert DLTensorView(arr.__dlpack__()).dtype == name


def test_bfloat16_goes_both_ways_through_torch():
    tensor = torch.arange(4, dtype=torch.bfloat16)
    view = DLTensorView(tensor.__dlpack__())
    assert view.dtype == "bfloat16" and view.nbytes == 8
    out = torch.from_dlpack(DLPackExport(tensor.data_ptr(), (4,), "bfloat16", 1, 0, tensor))
    assert out.dtype == torch.bfloat16 and out.data_ptr() == tensor.data_ptr()


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_torch_from_export_shares_memory_and_keeps_the_owner_alive(max_version):
    arr = np.arange(12, dtype=np.int64).reshape(3, 4)
    watched = Owner(arr)
    owner = weakref.ref(watched)
    export = export_of(arr, owner=watched)
    out = torch.from_dlpack(export)
    assert out.dtype == torch.int64 and tuple(out.shape) == (3, 4) and out.stride() == (4, 1)
    assert out.data_ptr() == arr.ctypes.data
    out[0, 0] = 99
    assert arr[0, 0] == 99
    del watched, export, arr
    gc.collect()
    assert owner() is not None
    del out
    gc.collect()
    assert owner() is None
    # the legacy capsule works for torch too
    arr = np.ones(3, dtype=np.float32)
    assert torch.utils.dlpack.from_dlpack(export_of(arr).__dlpack__(max_version=max_version)).tolist() == [1, 1, 1]


def test_jax_reads_an_export():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    try:
        out = jnp.from_dlpack(export_of(arr))
    except SystemError as error:  # opforge's own outputs then go to JAX as copies (Placement.wrap)
        assert jax.default_backend() == "gpu"
        pytest.xfail(f"JAX with a GPU backend cannot import host DLPack arrays (a JAX bug): {error}")
    assert out.dtype == jnp.float32 and out.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(out), arr)


def test_capsule_kinds_follow_max_version():
    arr = np.zeros((2, 3), dtype=np.float32)
    export = export_of(arr)
    assert export.__dlpack_device__() == (1, 0)
    assert capsule_name(export.__dlpack__()) == "dltensor"
    assert capsule_name(export.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(export.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(export.__dlpack__(max_version=(2, 3), stream=None, dl_device=(1, 0), copy=False)) == \
        "dltensor_versioned"
    view = DLTensorView(export.__dlpack__(max_version=(1, 0)))
    assert view.versioned and not view.readonly
    assert (view.data, view.shape, view.strides, view.dtype, view.device) == \
        (arr.ctypes.data, (2, 3), (3, 1), "float32", (1, 0))


def test_export_refuses_copies_moves_and_positional_arguments():
    export = export_of(np.zeros(4, dtype=np.float32))
    with pytest.raises(BufferError, match="cannot copy"):
        export.__dlpack__(copy=True)
    with pytest.raises(BufferError, match=r"on device \(1, 0\), not \(2, 0\)"):
        export.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError):
        export.__dlpack__(None)  # every argument is keyword-only
    with pytest.raises(TypeError, match="max_version must be a pair"):
        export.__dlpack__(max_version=(1,))


def test_readonly_export_is_versioned_only():
    arr = np.arange(4, dtype=np.float32)
    export = export_of(arr, readonly=True)
    with pytest.raises(BufferError, match="read-only"):
        export.__dlpack__()
    assert DLTensorView(export.__dlpack__(max_version=(1, 0))).readonly
    out = np.from_dlpack(export)
    assert not out.flags.writeable and np.shares_memory(out, arr)


def test_export_checks_its_arguments():
    arr = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="dtype 'complex64' is not one of bool, int8"):
        DLPackExport(arr.ctypes.data, (4,), "complex64", 1, 0, arr)
    with pytest.raises(ValueError, match="negative dim -4"):
        DLPackExport(arr.ctypes.data, (-4,), "float32", 1, 0, arr)
    with pytest.raises(ValueError, match=r"device \(0, 0\) is not a DLPack device"):
        DLPackExport(arr.ctypes.data, (4,), "float32", 0, 0, arr)
    with pytest.raises(TypeError):
        DLPackExport(arr.ctypes.data, 4, "float32", 1, 0, arr)
    with pytest.raises(TypeError):
        DLPackExport("0x10", (4,), "float32", 1, 0, arr)
    with pytest.raises(OverflowError):
        DLPackExport(-1, (4,), "float32", 1, 0, arr)


def test_export_tells_its_dtype_shape_and_device():
    arr = np.zeros((2, 3), dtype=np.int64)
    export = fake_cuda(arr, device_id=1)
    assert (export.dtype, export.shape, export.device) == ("int64", (2, 3), (2, 1))
    assert export_of(np.zeros((), np.float16)).shape == ()
    bfloat = DLPackExport(arr.ctypes.data, (4,), "bfloat16", 2, 0, arr)
    assert bfloat.dtype == "bfloat16"


def test_export_sync_gets_the_consumer_s_stream_before_a_capsule_is_made():
    arr = np.arange(4, dtype=np.float32)
    asked = []
    export = DLPackExport(arr.ctypes.data, (4,), "float32", 2, 0, arr, sync=asked.append)
    DLTensorView(export.__dlpack__(stream=0x77, max_version=(1, 0)))
    DLTensorView(export.__dlpack__())
    assert asked == [0x77, None]
    owner = weakref.ref(arr)

    def refuse(stream):
        raise BufferError(f"no stream {stream}")

    refusing = DLPackExport(arr.ctypes.data, (4,), "float32", 2, 0, arr, sync=refuse)
    with pytest.raises(BufferError, match="no stream 5"):
        refusing.__dlpack__(stream=5)
    with pytest.raises(BufferError, match="cannot copy"):  # the arguments are checked first
        export.__dlpack__(stream=9, copy=True)
    assert asked == [0x77, None]
    with pytest.raises(TypeError, match="sync must be callable"):
        DLPackExport(arr.ctypes.data, (4,), "float32", 2, 0, arr, sync=3)
    del arr, export, refusing
    gc.collect()
    assert owner() is None  # no capsule was left holding the owner


def test_export_of_scalars_and_empty_arrays():
    scalar = np.array(2.5, dtype=np.float64)
    out = np.from_dlpack(export_of(scalar))
    assert out.shape == () and out == 2.5 and np.shares_memory(out, scalar)
    empty = np.zeros((0, 3), dtype=np.int32)
    view = DLTensorView(export_of(empty).__dlpack__())
    assert view.shape == (0, 3) and view.strides == (3, 1) and view.nbytes == 0 and view.c_contiguous
    assert np.from_dlpack(export_of(empty)).shape == (0, 3)


def test_an_export_and_its_owner_in_a_cycle_are_collected():
    watched = Owner(np.zeros(2, dtype=np.float32))
    watched.export = export_of(watched.array, owner=watched)
    owner = weakref.ref(watched)
    del watched
    gc.collect()
    assert owner() is None


# ------------------------------------------------------ the deleter's count

def test_export_deleter_runs_once_whoever_ends_the_capsule():
    owner = Owner(None)
    base = sys.getrefcount(owner)
    export = DLPackExport(0, (0,), "float32", 1, 0, owner)
    assert sys.getrefcount(owner) == base + 1
    for max_version in (None, (1, 0)):
        unconsumed = export.__dlpack__(max_version=max_version)
        assert sys.getrefcount(owner) == base + 2
        del unconsumed  # the capsule's destructor releases it
        assert sys.getrefcount(owner) == base + 1
        capsule = export.__dlpack__(max_version=max_version)
        view = DLTensorView(capsule)
        del capsule  # consumed: its destructor must leave the tensor to the view
        assert sys.getrefcount(owner) == base + 2
        del view
        assert sys.getrefcount(owner) == base + 1
    del export
    assert sys.getrefcount(owner) == base


@pytest.mark.parametrize("versioned", [False, True])
def test_export_deleter_takes_the_gil_from_a_thread_without_it(versioned):
    """Consumers may drop a tensor on any thread; ctypes calls the deleter with the GIL released."""
    owner = Owner(None)
    base = sys.getrefcount(owner)
    capsule = DLPackExport(0, (2,), "float32", 1, 0, owner).__dlpack__(max_version=(1, 0) if versioned else None)
    name = capsule_name(capsule).encode()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    set_name = ctypes.pythonapi.PyCapsule_SetName
    set_name.restype, set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    managed = get_pointer(capsule, name)
    used = b"used_" + name
    assert set_name(capsule, used) == 0  # consume it, as a foreign framework would
    deleter_offset = 16 if versioned else 56  # DLManagedTensorVersioned::deleter / DLManagedTensor::deleter
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.c_void_p.from_address(managed + deleter_offset).value)
    assert sys.getrefcount(owner) == base + 1
    thread = threading.Thread(target=deleter, args=(managed,))
    thread.start()
    thread.join()
    assert sys.getrefcount(owner) == base
    del capsule  # consumed: nothing more is released
    assert sys.getrefcount(owner) == base


def test_view_releases_a_numpy_producer_once():
    arr = np.arange(4, dtype=np.float32)
    base = sys.getrefcount(arr)
    view = DLTensorView(arr.__dlpack__(max_version=(1, 0)))
    assert sys.getrefcount(arr) > base
    del view
    assert sys.getrefcount(arr) == base


def test_view_that_fails_still_hands_the_tensor_back():
    arr = np.zeros(3, dtype=np.complex64)
    base = sys.getrefcount(arr)
    capsule = arr.__dlpack__(max_version=(1, 0))
    with pytest.raises(ValueError, match=r"DLPack dtype \(code 5, bits 64, lanes 1\) has no opforge dtype"):
        DLTensorView(capsule)
    assert capsule_name(capsule) == "used_dltensor_versioned"  # consumed, then released by the failed view
    assert sys.getrefcount(arr) == base
    with pytest.raises(ValueError, match="already consumed"):
        DLTensorView(capsule)


def test_view_rejects_what_is_not_a_fresh_dlpack_capsule():
    with pytest.raises(TypeError, match="takes a DLPack capsule"):
        DLTensorView(np.zeros(3))
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = b"not_a_tensor"  # must outlive the capsule
    other = new_capsule(id(name), name, None)
    with pytest.raises(ValueError, match="not a DLPack capsule: named 'not_a_tensor'"):
        DLTensorView(other)
    capsule = np.zeros(2).__dlpack__()
    DLTensorView(capsule)
    with pytest.raises(ValueError, match="already consumed .*'used_dltensor'"):
        DLTensorView(capsule)


# ------------------------------------------------- views of other producers

@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_view_of_numpy(max_version):
    arr = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    capsule = arr.__dlpack__(max_version=max_version)
    view = DLTensorView(capsule)
    assert capsule_name(capsule) == ("used_dltensor_versioned" if max_version else "used_dltensor")
    assert view.versioned == (max_version is not None)
    assert (view.data, view.shape, view.dtype, view.device, view.ndim) == (arr.ctypes.data, (2, 3, 4), "int16",
                                                                           (1, 0), 3)
    assert view.strides in (None, (12, 4, 1)) and view.c_contiguous and view.nbytes == 48
    assert not view.readonly
    frozen = np.arange(3.0)
    frozen.flags.writeable = False
    assert DLTensorView(frozen.__dlpack__(max_version=(1, 0))).readonly


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_view_of_torch(max_version):
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = DLTensorView(tensor.__dlpack__(max_version=max_version))
    assert view.versioned == (max_version is not None)
    assert (view.data, view.shape, view.strides, view.dtype, view.device) == \
        (tensor.data_ptr(), (3, 4), (4, 1), "float32", (1, 0))
    assert view.c_contiguous and view.nbytes == 48 and view.ndim == 2
    transposed = DLTensorView(tensor.T.__dlpack__(max_version=max_version))
    assert (transposed.data, transposed.shape, transposed.strides) == (tensor.data_ptr(), (4, 3), (1, 4))
    assert not transposed.c_contiguous
    rows = tensor[1:]
    sliced = DLTensorView(rows.__dlpack__(max_version=max_version))  # data + byte_offset, whichever the producer uses
    assert sliced.data == rows.data_ptr() == tensor.data_ptr() + 16 and sliced.c_contiguous
    boolean = DLTensorView(torch.tensor([True, False]).__dlpack__(max_version=max_version))
    assert boolean.dtype == "bool" and boolean.nbytes == 2


def test_size_one_dims_do_not_break_contiguity():
    odd = torch.empty(4, 1).as_strided((4, 1), (1, 7))
    view = DLTensorView(odd.__dlpack__())
    assert view.strides == (1, 7) and view.c_contiguous
    gap = DLTensorView(torch.empty(4, 2)[:, :1].__dlpack__())
    assert gap.strides == (2, 1) and not gap.c_contiguous  # rows 2 apart: not compact
    assert DLTensorView(np.zeros((0, 3)).T.__dlpack__()).c_contiguous  # empty: nothing out of place


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_view_of_jax(max_version):
    array = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    view = DLTensorView(array.__dlpack__(max_version=max_version))  # JAX may answer with either capsule
    assert (view.data, view.shape, view.dtype, view.device) == (array.unsafe_buffer_pointer(), (2, 3), "float32",
                                                                (1, 0))
    assert view.c_contiguous and view.nbytes == 24 and not view.readonly
    assert DLTensorView(jnp.zeros(3, dtype=jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
                        .__dlpack__()).dtype in ("int64", "int32")


# ---------------------------------------------------------- fake CUDA arrays

def test_fake_cuda_export_reads_as_a_cuda_tensor():
    arr = np.arange(8, dtype=np.float32)
    fake = fake_cuda(arr, device_id=1)
    assert fake.__dlpack_device__() == (2, 1)
    view = DLTensorView(fake.__dlpack__(max_version=(1, 0), stream=7))  # any stream: ignored by design
    assert (view.device, view.data, view.shape, view.dtype) == ((2, 1), arr.ctypes.data, (8,), "float32")
    with pytest.raises(BufferError, match=r"on device \(2, 1\), not \(1, 0\)"):
        fake.__dlpack__(dl_device=(1, 0))
    with pytest.raises((RuntimeError, BufferError), match="Unsupported device"):
        np.from_dlpack(fake)  # NumPy reads host memory only (BufferError from 2.5 on)


def test_types_are_registered_on_the_module():
    assert _native.DLTensorView is DLTensorView and _native.DLPackExport is DLPackExport
    assert "float32(2, 3) on (1, 0)" in repr(DLTensorView(np.zeros((2, 3), dtype=np.float32).__dlpack__()))
