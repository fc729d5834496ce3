"""Provisioners: adapters that start and stop cloud instances (see burst.ports.Provisioner)."""
