import sys
from pathlib import Path

# Test helpers (oracle_streams) live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))
