"""The serve deploy's decisions: host data, the lock, the preflight, the launch, the
service's files and the checks' plan (roles/service, roles/sglang and roles/checks act
on them)."""
