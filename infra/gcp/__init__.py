"""GCP: the Compute Engine cluster program (`program.py`), how its declared resources read to a
reviewer (`review.py`), and the host-key fetcher a node runs at boot (`host_key.py`)."""
