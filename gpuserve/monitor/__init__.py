"""The monitor host's plan: scrape targets from the inventory, Prometheus's config,
recording and alert rules, dashboards; and the figures read back from the hosts' metrics
(fleet status, rolling switches). Pure: inventory data in, file texts out."""
