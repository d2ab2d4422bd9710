"""AWS: the EC2 cluster program (`program.py`) and how its declared resources read to a reviewer
(`review.py`)."""
