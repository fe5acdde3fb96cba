"""SGLang's benchmark package in the lab stand-in: only ``serving`` (the online client)."""
