import pytest


@pytest.fixture(scope="session", autouse=True)
def opforge_cache_dir(tmp_path_factory):
    """Every kernel built during the test session goes into one fresh cache folder."""
    path = tmp_path_factory.mktemp("opforge-cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("OPFORGE_CACHE_DIR", str(path))
    yield path
    patch.undo()
