"""The Pulumi programs: one ComponentResource per cloud behind a cloud-neutral spec."""
