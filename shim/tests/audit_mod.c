/* The smallest rtld-audit library: one that only says it exists (LD_AUDIT). */
unsigned int la_version(unsigned int version);
unsigned int la_version(unsigned int version)
{
    return version;
}
