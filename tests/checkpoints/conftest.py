"""Fixtures of the checkpoint tests."""
from tests.checkpoints.hf_models import hf_models  # pylint: disable=unused-import
