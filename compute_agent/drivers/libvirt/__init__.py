"""The libvirt driver: host data from libvirt's XML and sysfs, guests as
libvirt domains, live migration by libvirt."""
