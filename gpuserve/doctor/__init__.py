"""The doctor: rules against a host's facts; rule metadata stays in data/rules/."""
