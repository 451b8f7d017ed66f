"""Models-from-code entry point of the served retriever: MLflow runs this file to build the model
when it is logged and loaded, so nothing is pickled (loading a version executes this reviewed
code, not a serialized object)."""

import mlflow

from tracking.pyfunc import RetrieverModel

mlflow.models.set_model(RetrieverModel())
