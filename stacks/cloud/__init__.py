"""The cloud backend: one Pulumi stack per sortie (`pulumi_backend.py`), through the Automation
API or the CLI (`automation.py`, `stack_api.py`), its record here (`cloud_records.py`), its
outputs read as untrusted (`outputs.py`), where it may launch (`sites.py`), its teardown proven
(`teardown.py`), `sortie plan` (`plan.py`), `sortie init` (`project.py`) and whether the profile
lets this machine in (`ssh_sources.py`); how a controller reaches the clouds' state, light
for every listing to take (`access.py`)."""
