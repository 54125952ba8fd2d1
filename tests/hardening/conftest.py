"""The bundle fixtures (a real measured trial in a real store, and bundles exported from it)."""

from tests.bundle.conftest import bundle, stored  # noqa: F401 - re-exported fixtures
