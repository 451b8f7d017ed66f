"""MLflow integration (runs, model registry, pyfunc serving). Kept out of ``model_code`` so the
ML library stays importable and testable without a tracking backend."""
