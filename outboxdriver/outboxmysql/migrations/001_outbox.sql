-- The outbox table, MySQL 8 / MariaDB 10.6+'s closest equivalent of the PostgreSQL one.
-- seq (AUTO_INCREMENT, assigned at insert) is the write order; the relay never uses it
-- as a high-water mark. Times are UTC.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    seq                BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id                 CHAR(36)     NOT NULL,
    aggregatetype      VARCHAR(255) NOT NULL,
    aggregateid        VARCHAR(1024) NOT NULL,
    type               VARCHAR(255) NOT NULL,
    payload            LONGBLOB     NULL,
    headers            TEXT         NULL,
    tracingspancontext TEXT         NULL,
    created_at         DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    published_at       DATETIME(6)  NULL,
    attempts           INT          NOT NULL DEFAULT 0,
    last_error         TEXT         NULL,
    available_at       DATETIME(6)  NULL,
    UNIQUE KEY {{.IDIndex}} (id),
    KEY {{.UnpublishedIndex}} (published_at, seq),
    KEY {{.FailingIndex}} (aggregatetype(191), aggregateid(191), attempts, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{.DeadTable}} (
    id                 CHAR(36)     NOT NULL PRIMARY KEY,
    aggregatetype      VARCHAR(255) NOT NULL,
    aggregateid        VARCHAR(1024) NOT NULL,
    type               VARCHAR(255) NOT NULL,
    payload            LONGBLOB     NULL,
    headers            TEXT         NULL,
    tracingspancontext TEXT         NULL,
    seq                BIGINT       NOT NULL,
    created_at         DATETIME(6)  NOT NULL,
    attempts           INT          NOT NULL,
    error              TEXT         NOT NULL,
    dead_at            DATETIME(6)  NOT NULL,
    holds_key          BOOLEAN      NOT NULL,
    KEY {{.DeadHoldIndex}} (aggregatetype(191), aggregateid(191), holds_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
