"""The backends that make clusters (local sshd daemons, one Pulumi stack per cloud sortie), what
each cloud needs beyond its Pulumi program (`stacks/clouds/`), and the stack profiles."""
