"""Floor 1: domain errors with a kind and a field's pointer, the one table kind -> HTTP status
and the RFC 9457 bodies, and suggestions checked by re-planning."""
