"""Evidence at tiny scale for three of the seeds' design choices (issue 25), as one resumable recipe.

Studies (``config.STUDIES``), each a set of arms trained at equal parameters and tokens over seeds with
longmoe's ``Trainer`` on the embedded standard-library corpus:

- ``decay``: the bounded KDA gate ``g_min·sigmoid(e^A·h)`` against the unbounded ``−e^A·softplus(h)``,
  both through the same all-GEMM chunk path, trained in bf16 autocast: non-finite events, the most
  negative in-chunk log-decay ``Γ`` (the all-GEMM form overflows below ≈ −88), loss curves;
- ``attnres``: block attention residuals against plain residuals at the tiny depth and a deeper, thinner
  stack: validation loss with standard errors over seeds;
- ``balance``: the quantile / sign / aux / no balancer on a tiny MoE LM with E = 256 experts: final
  MaxVio, dead experts, loss.

``python -m longmoe.pipelines.ablations --help``; every finished run is a JSON file under
``OUT/<study>/`` that a rerun reads instead of retraining; ``report.md`` and the figures are rebuilt from
them. (The operator-speed half of the decay question lives in ``bench/kda.py``.)
"""

from longmoe.pipelines.ablations.config import STUDIES, AblationConfig
from longmoe.pipelines.ablations.result import RunResult
from longmoe.pipelines.ablations.run import run_ablations

__all__ = ["STUDIES", "AblationConfig", "RunResult", "run_ablations"]
