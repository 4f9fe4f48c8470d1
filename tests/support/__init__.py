"""Test support: throwaway MariaDB and Redis servers, shared paths.

Nothing here starts at import time; the session fixtures in
``tests/conftest.py`` start a server the first time a test asks for it.
"""
