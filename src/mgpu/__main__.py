from mgpu.client.cli import main

main()
