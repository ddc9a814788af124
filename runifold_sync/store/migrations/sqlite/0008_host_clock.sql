-- Store time from the host's boot clock (see runifold_sync/store/sqlite_clock.py): the
-- anchor is set by the first store that opens the file on each boot.
ALTER TABLE runifold_clock ADD COLUMN boot_id TEXT;
ALTER TABLE runifold_clock ADD COLUMN anchor_us INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runifold_clock ADD COLUMN anchor_uptime_us INTEGER NOT NULL DEFAULT 0;
