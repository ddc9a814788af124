-- Version 8 anchors SQLite's store time to the host's boot clock. PostgreSQL's store time
-- is already one clock, the server's (clock_timestamp() plus runifold_clock's offset):
-- nothing changes here, and the version stays the same on both dialects.
SELECT 1;
