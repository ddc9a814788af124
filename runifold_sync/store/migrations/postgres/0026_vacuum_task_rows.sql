-- Version 26: autovacuum visits the task table by its churn, not by its size. Every claim,
-- step commit and completion leaves a dead version of a task row, while finished tasks are
-- kept until pruned, so under PostgreSQL's default (vacuum once a fifth of the rows are
-- dead) the dead versions grew with the tasks ever stored: 785,000 at the peak of a
-- 30-minute run of 2.3 million tasks (benchmarks/dead_tuples.py). Vacuumed once 1,000
-- rows and 1% of the table are dead, and analyzed at 2%, the table keeps its dead rows
-- near what the work of one autovacuum round leaves; finished rows are all-visible, so a
-- visit reads only the pages that changed since the last.
ALTER TABLE runifold_tasks SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);
