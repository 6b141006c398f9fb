"""MLflow's tracking server with one page more: the runs of an experiment in the model-training view, kept.

MLflow 3's UI keeps a workflow type of its own, GenAI by default, whatever the experiment's tags say. An
address with ``workflowType=machine_learning`` shows the model-training view, but the UI only reads it
from that address: the next click (a run) goes back to the type the UI stored in the browser's local
storage, under ``mlflow.workflowType_v1`` (a JSON string; read from MLflow 3.17.2's UI code, where the
workflow-type context keeps it with its versioned local-storage hook), which a first visit leaves at GenAI.

:data:`OPEN_ROUTE` stores ``"machine_learning"`` there, in the server's own origin (local storage belongs
to it), and goes on to the experiment's runs as charts, so every page reached from there keeps the
model-training view. ``python -m rl_lightning ui`` serves this app (registered as MLflow's app plugin
``rl_lightning``, ``mlflow server --app-name rl_lightning``) and prints the page's address.
"""

from __future__ import annotations

import json

from fastapi.responses import HTMLResponse
from mlflow.server.fastapi_app import app

__all__ = ["OPEN_ROUTE", "STORAGE_KEY", "app", "open_page"]

#: The UI's local-storage entry of its workflow type (MLflow 3.17's versioned key) and the value wanted.
STORAGE_KEY, MODEL_TRAINING = "mlflow.workflowType_v1", "machine_learning"
#: The page that keeps the model-training view and opens an experiment's runs as charts.
OPEN_ROUTE = "/rl-lightning/experiments/{experiment_id}"
#: Where it goes on to (MLflow's own route, in the model-training view, runs as charts).
RUNS_PAGE = "/#/experiments/{id}/runs?workflowType=machine_learning&compareRunsMode=CHART"


def open_page(experiment_id: str) -> str:
    """The HTML that stores the model-training view and opens ``experiment_id``'s runs."""
    target = RUNS_PAGE.format(id=int(experiment_id))  # an id is a number: nothing else reaches the page
    return (
        "<!doctype html><meta charset='utf-8'><title>rl_lightning runs</title><script>"
        f"localStorage.setItem({json.dumps(STORAGE_KEY)}, {json.dumps(json.dumps(MODEL_TRAINING))});"
        f"location.replace({json.dumps(target)});</script>"
        f"<noscript><a href='{target}'>the runs</a></noscript>"
    )


def _open_experiment(experiment_id: int) -> HTMLResponse:
    return HTMLResponse(open_page(str(experiment_id)))


# First among the routes: MLflow mounts its Flask app at "/", which would answer every path after it.
app.add_api_route(OPEN_ROUTE, _open_experiment, response_class=HTMLResponse, include_in_schema=False)
app.router.routes.insert(0, app.router.routes.pop())
