"""Fleet: distributed autotuning on Celery workers, with every trial kept in the database."""

__version__ = "0.1.0"
