"""Puts scripts/ on sys.path so the tests can import bench_serving."""
import os
import sys

SOURCE = os.environ.get("BATON_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
DATA = os.path.join(SOURCE, "tests", "data")
