"""The host names the dashboard answers to in tests: starlette's TestClient sends its requests
(websockets included) as ``testserver``."""

from webui.guard import LOOPBACK_NAMES

TEST_HOSTS = (*LOOPBACK_NAMES, "testserver")
