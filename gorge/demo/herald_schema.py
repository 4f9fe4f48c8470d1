"""The herald tables on SQLite, for the demo and the tests that run the store on it.

Phorge creates these tables in production (gorge-webhook never does); the
demo plays Phorge, so it brings Phorge's layout and keys, nothing more: the
demo must behave as production does.
"""

HERALD_SCHEMA = """
CREATE TABLE IF NOT EXISTS herald_webhook (
  id INTEGER PRIMARY KEY AUTOINCREMENT, phid BLOB NOT NULL UNIQUE,
  name TEXT NOT NULL, webhookURI TEXT NOT NULL, viewPolicy BLOB NOT NULL,
  editPolicy BLOB NOT NULL, status TEXT NOT NULL, hmacKey TEXT NOT NULL,
  dateCreated INTEGER NOT NULL, dateModified INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS key_status ON herald_webhook (status);
CREATE TABLE IF NOT EXISTS herald_webhookrequest (
  id INTEGER PRIMARY KEY AUTOINCREMENT, phid BLOB NOT NULL UNIQUE,
  webhookPHID BLOB NOT NULL, objectPHID BLOB NOT NULL, status TEXT NOT NULL,
  properties TEXT NOT NULL, lastRequestResult TEXT NOT NULL,
  lastRequestEpoch INTEGER NOT NULL, dateCreated INTEGER NOT NULL,
  dateModified INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS key_ratelimit ON herald_webhookrequest
  (webhookPHID, lastRequestResult, lastRequestEpoch);
CREATE INDEX IF NOT EXISTS key_collect ON herald_webhookrequest (dateCreated);
"""
