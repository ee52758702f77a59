"""When a refresh re-binds a champion to a new index version: the tolerance, in points of its own dev metric.

Read by the refresh flow and by the command line, which must not import Prefect or MLflow to show the default.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class RefreshPolicy(BaseModel):
    """How far below its bound score a champion may score on the new index and still move to it."""

    tolerance: float = Field(1.0, ge=0.0, description="points (hundredths) of the champion's own dev metric")


TOLERANCE_POINTS = RefreshPolicy().tolerance
