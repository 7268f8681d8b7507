"""Every file plansim reads or writes: the data-file reader, whole-file writes, the shipped data's folder."""
