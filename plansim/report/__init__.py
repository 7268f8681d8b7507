"""Reports: terminal tables now; DataFrames, charts and Chrome traces as later issues add them."""
