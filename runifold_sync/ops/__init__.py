"""What operators read and watch: read models of the store, metrics, tracing."""
