"""What runs, from which wheel: profiles, flag catalogs and dialects, locks."""
