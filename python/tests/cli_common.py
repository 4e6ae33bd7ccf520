"""Paths and skip markers shared by the CLI tests (pytest puts this directory on sys.path, so
the test files import it as `cli_common`)."""
import os

import pytest

BIN = os.environ.get("SCALESWEEP_BIN")
DATA = os.environ.get("SS_SHARED_DATA_DIR",
                      os.path.join(os.path.dirname(__file__), "../../../shared/data"))
MODEL = os.path.join(DATA, "models/stories260K/stories260K.bin")
TOK = os.path.join(DATA, "models/stories260K/tok512.bin")
VAL = os.path.join(DATA, "text/tinystories_val.txt")

need_bin = pytest.mark.skipif(not BIN, reason="SCALESWEEP_BIN not set (run through ctest)")


def need_files(*paths):
    """Skips (visibly) unless every path exists."""
    missing = [p for p in paths if not os.path.exists(p)]
    return pytest.mark.skipif(bool(missing), reason=f"shared data absent ({', '.join(missing)})")


need_data = need_files(MODEL, VAL)
