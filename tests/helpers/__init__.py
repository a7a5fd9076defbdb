"""What several test modules share: jobs and processors, data builders, reference models, fixtures and helpers.

Test modules import them as ``from helpers.counting import Count`` (pytest puts tests/ on ``sys.path``, see
tests/conftest.py), never from another test module. The fixtures (``spark``, ``s3_uri``) are plugins that
tests/conftest.py names in ``pytest_plugins``: every test gets them by argument, without importing them."""
