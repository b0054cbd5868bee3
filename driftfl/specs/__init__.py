"""What each method, local objective and part declares for the check of an experiment, importable
without torch or Flower: its settings, what it sends and needs, and what privacy and secure
aggregation cannot cover. `driftfl run` refuses a bad value or pair with these alone, in a
blink (docs/running.md); the strategies (driftfl.strategies, driftfl.dcfl), the objectives
(driftfl.client.objectives) and the parts implement them, each class taking its declaration's
values (``spec``). A method declared only on its class (docs/adding-a-method.md's) registers its
declaration when the class is defined.
"""

from __future__ import annotations

from driftfl.specs.base import (METHOD_SPECS, OBJECTIVE_SPECS, MethodSpec, ObjectiveSpec,
                                PartSpec, declare_method, declare_objective, no_problem,
                                variants_of)
# the built-ins declare themselves on import
from driftfl.specs import methods, objectives, parts  # noqa: I001

AGGREGATION_SPECS = parts.AGGREGATIONS
SELECTION_SPECS = parts.SELECTIONS

__all__ = ["AGGREGATION_SPECS", "METHOD_SPECS", "OBJECTIVE_SPECS", "SELECTION_SPECS",
           "MethodSpec", "ObjectiveSpec", "PartSpec", "declare_method", "declare_objective",
           "no_problem", "variants_of"]
