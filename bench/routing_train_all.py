"""Train (or find cached) every gate model the routing evaluation and `make models` use, in one go."""
import logging
import sys

from services.evals.routing_models import prepare_training_env

prepare_training_env()
from services.evals.routing_models import fold_models, holdout_model, train_cached  # noqa: E402
from services.training.data import assign_folds, load_queries, load_registry  # noqa: E402
from services.training.gate import GateHyperParams  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
queries, tools = sys.argv[1], sys.argv[2]
Q, R = load_queries(queries), load_registry(tools)
hp = GateHyperParams()
folds = assign_folds(Q, 3, 0)
print(fold_models(Q, folds, 3, R, hp, "var/models"), flush=True)
print(holdout_model(Q, "kubernetes", R, hp, "var/models"), flush=True)
print(train_cached(Q, R, hp, "var/models", label="production"), flush=True)
