"""Pipeline parallelism: schedules, each stage's pass order, which layers a stage runs."""
