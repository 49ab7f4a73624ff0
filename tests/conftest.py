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
