"""Reports: a Result in the terminal (``text``), tables that fit it (``fit``), the progress of a long command
(``progress``), and every chart, made and written one way (``figures``)."""
