"""The backends that make clusters (local sshd daemons, one Pulumi stack per cloud sortie,
clusters sortie did not create), what each keeps of its sorties, and the stack profiles. What a
cloud itself is asked (credentials, zones, the tag sweep) lives with its program, in
`infra/<cloud>/home.py`."""
