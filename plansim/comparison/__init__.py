"""``plansim compare``: strategies and hardware side by side, and what it writes."""
