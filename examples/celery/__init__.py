"""A phaserunner deployment on Celery workers (see app.py)."""
