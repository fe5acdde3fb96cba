"""The prepare-time plans of the host and gateway deploys: above every domain package
(host, launch, measure, fleet, serve), whose decisions they combine."""
