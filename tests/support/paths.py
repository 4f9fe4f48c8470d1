"""Where the repository and the shared, read-only material live.

``shared/`` sits beside the repository root (``<repo>/../shared``) unless
``GORGE_SHARED_DIR`` points elsewhere. Tests only ever read from it.
"""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DIR = Path(
    os.environ.get("GORGE_SHARED_DIR") or REPO_ROOT.parent / "shared"
).resolve()
SCHEMA_DIR = SHARED_DIR / "schema"
GOLDEN_DIR = SHARED_DIR / "golden"
