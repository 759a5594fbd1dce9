from timeshare.cli import main

main()
