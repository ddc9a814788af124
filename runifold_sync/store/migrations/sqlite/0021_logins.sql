-- Version 21: operators' logins (store.start_login, the dashboard's sessions), by the
-- SHA-256 of the id a browser's signed cookie carries. Kept in the store, not only in
-- the cookie, so a logout or an expiry ends a login for every process that serves the
-- dashboard: a cookie kept from before a logout no longer acts.
CREATE TABLE runifold_logins (
    digest TEXT PRIMARY KEY,
    started_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
