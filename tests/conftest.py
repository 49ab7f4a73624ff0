import pytest

import opforge


@pytest.fixture(scope="session", autouse=True)
def opforge_cache_dir(tmp_path_factory):
    """Every kernel built during the test session goes into one fresh cache folder."""
    path = tmp_path_factory.mktemp("opforge-cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("OPFORGE_CACHE_DIR", str(path))
    patch.setenv("OPFORGE_QUIET", "1")  # no compile progress lines in tests' stderr (test_build_progress turns them on)
    yield path
    patch.undo()


@pytest.fixture
def fresh():
    """Names of ops a test declares (see helpers.declare); unregistered afterwards."""
    names = []
    yield names
    for name in names:
        opforge.registry.unregister(name)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Runs the test once on one thread and once on two (opforge's pool), restoring the size after."""
    before = opforge.get_num_threads()
    opforge.set_num_threads(request.param)
    yield request.param
    opforge.set_num_threads(before)


@pytest.fixture
def set_threads():
    """opforge.set_num_threads for the test to call; the pool's size is restored after."""
    before = opforge.get_num_threads()
    yield opforge.set_num_threads
    opforge.set_num_threads(before)


@pytest.fixture
def jax_on_host():
    """JAX arrays made in the test live on the CPU: JAX's default device is a GPU where it has one, and these
    tests are about host arrays (the GPU side is in test_gpu_*.py and test_jax_gpu.py)."""
    import jax

    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def dlpack_path_only(monkeypatch):
    """These tests are about the DLPack path; once opforge.torch or opforge.jax is imported (by
    another test module) an opforge op called on their arrays runs as a torch op or an XLA custom
    call instead (test_torch_bridge.py, test_jax_bridge.py)."""
    from opforge.runtime import dispatch

    monkeypatch.setattr(dispatch, "INTERCEPTORS", [i for i in dispatch.INTERCEPTORS
                                                   if not i.__module__.startswith(("opforge.torch", "opforge.jax"))])
