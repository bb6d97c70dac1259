"""consistency"""
