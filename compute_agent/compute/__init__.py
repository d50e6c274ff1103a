"""What each conductor request does on this host: the tracker (devices
chosen under the lock, one durable commit), the manager (claim, then the
driver, outside the lock), and reconciliation of the store with the
hypervisor and Placement."""
