"""The model job and its reference model live in :mod:`spate_tools.campaigns.model_job` (``spate fuzz`` runs them too);
re-exported here under the names the property-based tests import."""

from spate_tools.campaigns.model_job import OPS, TTL_MS, Model, ModelJob

__all__ = ["OPS", "TTL_MS", "Model", "ModelJob"]
