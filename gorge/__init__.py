"""gorge: Twisted daemons for Phorge background work."""
