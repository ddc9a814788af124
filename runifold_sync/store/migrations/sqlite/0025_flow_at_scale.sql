-- Version 25: flow control whose cost per claim does not grow with the running tasks or
-- with a rate's window. Each rated group's claims are numbered (seq, one more than the
-- group's last), so the claims in a window are the last number less the first one in it
-- (two index probes) instead of a count of every row in the window. The numbers of the
-- claims kept so far, in their order; the indexes follow in common/0025_flow_at_scale.sql.
ALTER TABLE runifold_flow_claims ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;

UPDATE runifold_flow_claims SET seq = (
    SELECT COUNT(*) FROM runifold_flow_claims d
    WHERE d.scope = runifold_flow_claims.scope AND d.name = runifold_flow_claims.name
        AND (d.at < runifold_flow_claims.at OR (d.at = runifold_flow_claims.at AND d.rowid <= runifold_flow_claims.rowid))
);
