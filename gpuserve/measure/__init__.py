"""What was measured: health, smoke, benchmark records, gates, results."""
